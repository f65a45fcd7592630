set datafile missing '?'
set terminal pngcairo size 1100,600 font 'sans,11' noenhanced
set output 'results/bn-study/report/fmnist-cnn-curves-seed3.png'
set multiplot layout 1,2 title 'fmnist-cnn (seed3)'
set grid
set key bottom right
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot 'results/bn-study/report/data/fmnist-cnn-curves-seed3-0.dat' using 1:2 with linespoints lw 2 title '1 replica'
set key top right
set ylabel 'train loss (log scale)'
set logscale y
plot 'results/bn-study/report/data/fmnist-cnn-curves-seed3-0.dat' using 1:3 with linespoints lw 2 title '1 replica'
unset logscale y
unset multiplot
set terminal svg size 1100,600 font 'sans,11' noenhanced
set output 'results/bn-study/report/fmnist-cnn-curves-seed3.svg'
set multiplot layout 1,2 title 'fmnist-cnn (seed3)'
set grid
set key bottom right
set xlabel 'epoch'
set ylabel 'test accuracy (%)'
plot 'results/bn-study/report/data/fmnist-cnn-curves-seed3-0.dat' using 1:2 with linespoints lw 2 title '1 replica'
set key top right
set ylabel 'train loss (log scale)'
set logscale y
plot 'results/bn-study/report/data/fmnist-cnn-curves-seed3-0.dat' using 1:3 with linespoints lw 2 title '1 replica'
unset logscale y
unset multiplot
set output
